# PSPNet R50-D8 with Switchable Whitening in the backbone where the released
# SW ResNet-50 has it (SyncSW: BW's statistics over every GPU's images),
# SyncBN in the other backbone layers and the heads, finetuned from that
# release (tools/model_converters/sw2mm.py --to mmseg).
_base_ = ['./pspnet_r50-d8.py', '../sw_runtime.py']
model = dict(
    backbone=dict(
        type='SWResNet',
        sw_cfg={{_base_.sync_sw_cfg}},
        init_cfg=dict(checkpoint={{_base_.sw_r50_checkpoint}})))
