# Table 2's SN (8,8) row: the (8,32) config with 8 GPUs x 8 images.
_base_ = './resnet50-sn_8xb32_in1k.py'
train_dataloader = dict(batch_size=8)
optim_wrapper = dict(optimizer=dict(lr=0.025))  # 0.1 x 64 / 256
custom_hooks = [
    dict(type='SNRatioHook', interval=500, log_layers=False),
    dict(type='SNBatchAverageHook', num_batches=782),  # 50000 / 64
]
auto_scale_lr = dict(base_batch_size=64)  # its LR is for 8 x 8
