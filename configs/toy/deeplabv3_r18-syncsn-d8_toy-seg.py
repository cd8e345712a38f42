# The segmentation demo with SyncSN: SN's BN statistics shared by all
# processes. Run it on several processes, e.g. on the CPU:
#   torchrun --nproc_per_node 2 tools/train.py THIS_CONFIG --launcher pytorch
_base_ = './deeplabv3_r18-sn-d8_toy-seg.py'
norm_cfg = dict(type='SyncSN', requires_grad=True)
model = dict(
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
