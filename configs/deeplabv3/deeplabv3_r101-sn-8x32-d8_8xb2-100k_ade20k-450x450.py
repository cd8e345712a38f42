# DeepLabV3 R101-D8 on ADE20K with SN in the backbone and both heads,
# finetuned from the released ResNet101v1+SN(8,32) (not a row of the
# paper's tables): the R50 SN (8,32) row with a deeper backbone.
_base_ = [
    '../_base_/models/deeplabv3_r101-sn-8x32-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
