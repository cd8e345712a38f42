# Table 2's SN (8,4) row: the (8,32) config with 8 GPUs x 4 images.
_base_ = './resnet50-sn_8xb32_in1k.py'
train_dataloader = dict(batch_size=4)
optim_wrapper = dict(optimizer=dict(lr=0.0125))  # 0.1 x 32 / 256
custom_hooks = [
    dict(type='SNRatioHook', interval=500, log_layers=False),
    dict(type='SNBatchAverageHook', num_batches=1563),  # 50000 / 32
]
auto_scale_lr = dict(base_batch_size=32)  # its LR is for 8 x 4
