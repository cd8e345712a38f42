# Table 4, lower part, row SN(scratch) / SN: the same network trained on COCO
# from random initialisation: nothing loaded, nothing frozen.
_base_ = './faster-rcnn_r50-sn-c4_120k_coco.py'
model = dict(
    backbone=dict(frozen_stages=-1, init_cfg=None),
    roi_head=dict(shared_head=dict(init_cfg=None)))
