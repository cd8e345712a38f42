# Table 7, ADE20K, the SN (8,2) row with group SN (ratio_groups=2) in the
# backbone and both heads. No published result.
_base_ = [
    '../_base_/models/deeplabv3_r50-gsn2-8x2-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
