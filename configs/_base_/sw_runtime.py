# What the Switchable Whitening configs share (with sn_runtime.py, which
# registers sn_mm): the authors' SW layer settings and the converted release
# checkpoints.

# The release's SW: BW + IW (sw_type 2), 16 channels a whitening group,
# 5 Newton steps, separate mean and covariance weights, running statistics
# with momentum 0.1 in PyTorch's convention (the batch's weight), which SW
# takes as SN and BN do: the release's 0.9 (the running value's weight).
sw_cfg = dict(
    type='SW', sw_type=2, num_pergroup=16, T=5, tie_weight=False, momentum=0.1)
sync_sw_cfg = dict(
    type='SyncSW',
    sw_type=2,
    num_pergroup=16,
    T=5,
    tie_weight=False,
    momentum=0.1)
# The released ImageNet SW ResNets, converted by
# tools/model_converters/sw2mm.py (--to mmdet or mmseg: a backbone; --to
# mmpretrain: the classifier).
sw_r50_checkpoint = 'checkpoints/resnet50_sw_mm.pth'
sw_r101_checkpoint = 'checkpoints/resnet101_sw_mm.pth'
