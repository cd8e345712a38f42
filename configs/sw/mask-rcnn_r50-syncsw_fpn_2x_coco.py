# Mask R-CNN R50-FPN (mmdet's 2x schedule, 8 GPUs x 2 images) on the
# released SW ResNet-50 (tools/model_converters/sw2mm.py --to mmdet):
# SyncSW where the release has SW, SyncBN in the other backbone layers, both
# learning (norm_eval=False: with 2 images a GPU, BW's statistics need the
# 16 of all GPUs). Neither SW paper nor release reports a COCO result.
_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_2x_coco.py',
    '../_base_/det_runtime.py',
    '../_base_/sw_runtime.py',
]
model = dict(
    backbone=dict(
        type='SWResNet',
        sw_cfg={{_base_.sync_sw_cfg}},
        norm_cfg=dict(type='SyncBN', requires_grad=True),
        norm_eval=False,
        init_cfg=dict(
            type='Pretrained', checkpoint={{_base_.sw_r50_checkpoint}})))
# The SN configs' practice: no decay on norm affine parameters, none on
# the importance weights.
optim_wrapper = {{_base_.gn_practice_optim_wrapper}}
