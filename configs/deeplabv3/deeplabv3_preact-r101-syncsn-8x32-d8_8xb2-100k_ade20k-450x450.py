# DeepLabV3 on ADE20K with SyncSN in the backbone and both heads, finetuned
# from the released pre-activation ResNet101v2+SN(8,32) (not a row of the
# paper's tables): the ResNet50v2 row with the deeper backbone.
_base_ = [
    '../_base_/models/deeplabv3_preact-r101-syncsn-8x32-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
