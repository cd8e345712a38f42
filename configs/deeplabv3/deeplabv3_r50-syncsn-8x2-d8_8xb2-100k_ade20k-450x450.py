# Table 7, ADE20K, row SyncSN (8,2): as SN (8,2), with SN's BN statistics
# synchronised over all GPUs (16 images).
_base_ = [
    '../_base_/models/deeplabv3_r50-syncsn-8x2-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
