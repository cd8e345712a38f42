# Table 4, lower part, row BN(scratch) / BN: the same network trained on COCO
# from random initialisation: nothing loaded, nothing frozen.
_base_ = './faster-rcnn_r50-bn-c4_120k_coco.py'
model = dict(
    backbone=dict(frozen_stages=-1, init_cfg=None),
    roi_head=dict(shared_head=dict(init_cfg=None)))
