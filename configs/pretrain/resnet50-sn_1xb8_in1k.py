# Table 2's SN (1,8) row: the (8,32) config with 1 GPU x 8 images.
_base_ = './resnet50-sn_8xb32_in1k.py'
train_dataloader = dict(batch_size=8)
optim_wrapper = dict(optimizer=dict(lr=0.003125))  # 0.1 x 8 / 256
custom_hooks = [
    dict(type='SNRatioHook', interval=500, log_layers=False),
    dict(type='SNBatchAverageHook', num_batches=6250),  # 50000 / 8
]
auto_scale_lr = dict(base_batch_size=8)  # its LR is for 1 x 8
