# Table 2's SN (8,2) row: the (8,32) config with 8 GPUs x 2 images.
_base_ = './resnet50-sn_8xb32_in1k.py'
train_dataloader = dict(batch_size=2)
optim_wrapper = dict(optimizer=dict(lr=0.00625))  # 0.1 x 16 / 256
custom_hooks = [
    dict(type='SNRatioHook', interval=500, log_layers=False),
    dict(type='SNBatchAverageHook', num_batches=3125),  # 50000 / 16
]
auto_scale_lr = dict(base_batch_size=16)  # its LR is for 8 x 2
