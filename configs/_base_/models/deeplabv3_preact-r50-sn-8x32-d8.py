# DeepLabV3 with SN in the backbone and both heads, finetuned
# from the released pre-activation ResNet50v2+SN(8,32) (not a row of the
# paper's tables): the R50 SN (8,32) row on sn_mm's PreActResNet, dilated
# to output stride 8 as the v1 rows are.
_base_ = './deeplabv3_r50-sn-8x32-d8.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='PreActResNet',
        depth=50,
        strides=(1, 2, 1, 1),
        dilations=(1, 1, 2, 4),
        out_indices=(0, 1, 2, 3),
        norm_cfg=dict(type='SN', requires_grad=True),
        norm_eval=False,
        init_cfg=dict(
            type='Pretrained',
            checkpoint={{_base_.sn_preact_r50_8x32_checkpoint}})))
