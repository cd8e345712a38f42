# The paper's video table (Table 10, Sec. "Video Recognition"), BN row, 8
# clips per GPU: mmaction2's I3D ResNet-50 Kinetics-400 recipe as it is
# (torchvision's ImageNet BN ResNet-50 inflated to 3D, 32 frames at interval
# 2, every norm layer over (T, H, W), BN not synchronised across GPUs, 8 GPUs
# x 8 clips, 100 epochs), with the paper's 10-clip testing: softmax scores
# averaged over 10 clips sampled regularly, each a 256 px centre crop.
# The GN and SN rows inherit this file.
_base_ = [
    'mmaction::recognition/i3d/'
    'i3d_imagenet-pretrained-r50_8xb8-32x2x1-100e_kinetics400-rgb.py',
    '../_base_/sn_runtime.py',
]
# sn_mm.video: InflatedResNet3d, and mmaction2 1.2.0 importable at all.
custom_imports = dict(
    imports=['sn_mm', 'sn_mm.video'], allow_failed_imports=False)

test_pipeline = [
    dict(type='DecordInit', io_backend='disk'),
    dict(
        type='SampleFrames',
        clip_len=32,
        frame_interval=2,
        num_clips=10,
        test_mode=True),
    dict(type='DecordDecode'),
    dict(type='Resize', scale=(-1, 256)),
    dict(type='CenterCrop', crop_size=256),
    dict(type='FormatShape', input_format='NCTHW'),
    dict(type='PackActionInputs')
]
test_dataloader = dict(dataset=dict(pipeline=test_pipeline))
# The LR (0.01) is for 8 GPUs x 8 clips; --auto-scale-lr scales it to yours.
auto_scale_lr = dict(enable=False, base_batch_size=64)
