# Table 2's GN (8,32) row, the baseline to SN's: the same recipe with
# GN (32 groups) in every norm layer.
_base_ = './resnet50-sn_8xb32_in1k.py'
model = dict(
    backbone=dict(norm_cfg=dict(type='GN', num_groups=32, requires_grad=True)))
train_dataloader = dict(batch_size=32)
optim_wrapper = dict(optimizer=dict(lr=0.1))  # 0.1 x 256 / 256
custom_hooks = []  # no SN layer
auto_scale_lr = dict(base_batch_size=256)  # its LR is for 8 x 32
