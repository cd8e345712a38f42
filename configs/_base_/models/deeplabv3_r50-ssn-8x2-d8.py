# The (8,2) row with Sparse SN (not a row of the paper's tables): finetunes
# the released ResNet50v1+SSN (8,2), whose layers all carry fixed one-hot
# ratios; both heads learn sparse ratios with SparsestMax, the radius growing
# from 0 to 1 over training (SSNRadiusHook). BN statistics per GPU.
_base_ = './deeplabv3_r50-sn-8x2-d8.py'
ssn_norm_cfg = dict(type='SN', ratio_fn='sparsestmax', requires_grad=True)
model = dict(
    backbone=dict(
        norm_cfg=ssn_norm_cfg,
        init_cfg=dict(checkpoint={{_base_.ssn_8x2_checkpoint}})),
    decode_head=dict(norm_cfg=ssn_norm_cfg),
    auxiliary_head=dict(norm_cfg=ssn_norm_cfg))
custom_hooks = [dict(type='SSNRadiusHook')]
