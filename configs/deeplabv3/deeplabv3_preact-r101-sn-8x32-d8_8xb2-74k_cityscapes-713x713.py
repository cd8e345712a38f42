# DeepLabV3 on Cityscapes with SN in the backbone and both heads, finetuned
# from the released pre-activation ResNet101v2+SN(8,32) (not a row of the
# paper's tables): the ResNet50v2 row with the deeper backbone.
_base_ = [
    '../_base_/models/deeplabv3_preact-r101-sn-8x32-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
