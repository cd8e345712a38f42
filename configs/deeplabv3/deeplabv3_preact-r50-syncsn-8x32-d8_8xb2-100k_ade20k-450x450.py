# DeepLabV3 on ADE20K with SyncSN in the backbone and both heads, finetuned
# from the released pre-activation ResNet50v2+SN(8,32) (not a row of the
# paper's tables): the SN row with SN's BN statistics synchronised over all
# GPUs.
_base_ = [
    '../_base_/models/deeplabv3_preact-r50-syncsn-8x32-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
