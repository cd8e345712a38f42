# `make demo-pretrain`, step 2: the toy Mask R-CNN (SN in backbone, FPN and
# heads) with its backbone started from the SN ResNet-18 that step 1,
# resnet18-sn_toy-cls.py, pretrained with mmpretrain. The classifier's
# checkpoint holds the backbone under `backbone.`; every entry, the SN
# layers' ratio logits (ratios='source') and batch-averaged statistics
# included, loads as it is. trusted=True: an mmengine training checkpoint
# also holds its log history, which PyTorch's safe loader refuses; this one
# is the demo's own.
_base_ = './mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py'
pretrained = 'work_dirs/demo-pretrain/cls/epoch_8.pth'
model = dict(
    backbone=dict(
        init_cfg=dict(
            _delete_=True,
            type='SNPretrained',
            checkpoint=pretrained,
            prefix='backbone.',
            ratios='source',
            trusted=True)))
