# Table 10, GN row, 4 clips per GPU (half the batch, half the LR).
_base_ = './i3d_imagenet-pretrained-r50-gn_8xb8-32x2x1-100e_kinetics400-rgb.py'
train_dataloader = dict(batch_size=4)
optim_wrapper = dict(optimizer=dict(lr=0.005))
auto_scale_lr = dict(base_batch_size=32)
