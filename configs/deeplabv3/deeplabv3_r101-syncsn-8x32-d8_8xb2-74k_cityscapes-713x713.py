# DeepLabV3 R101-D8 on Cityscapes with SyncSN in the backbone and both heads,
# finetuned from the released ResNet101v1+SN(8,32) (not a row of the
# paper's tables): the R50 SyncSN (8,32) row with a deeper backbone.
_base_ = [
    '../_base_/models/deeplabv3_r101-syncsn-8x32-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
