# DeepLabV3 on Cityscapes with SN in the backbone and both heads, finetuned
# from the released pre-activation ResNet50v2+SN(8,32) (not a row of the
# paper's tables): the R50 SN (8,32) row on sn_mm's PreActResNet, dilated
# to output stride 8 as the v1 rows are.
_base_ = [
    '../_base_/models/deeplabv3_preact-r50-sn-8x32-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
