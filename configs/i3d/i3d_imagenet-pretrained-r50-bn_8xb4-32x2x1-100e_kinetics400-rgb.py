# Table 10, BN row, 4 clips per GPU: the 8-clip row with half the batch and
# half the LR (linear scaling).
_base_ = './i3d_imagenet-pretrained-r50-bn_8xb8-32x2x1-100e_kinetics400-rgb.py'
train_dataloader = dict(batch_size=4)
optim_wrapper = dict(optimizer=dict(lr=0.005))
auto_scale_lr = dict(base_batch_size=32)
