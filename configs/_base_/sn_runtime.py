# What every sn_mm config shares: SN registered in each process (also in
# dataloader workers and distributed ranks).
custom_imports = dict(imports=['sn_mm'], allow_failed_imports=False)

# Pretrained backbones are files you bring (nothing is downloaded at run
# time); docs/configs_and_checkpoints.md says where each comes from.
# Override with --cfg-options model.backbone.init_cfg.checkpoint=PATH.
# tools/model_converters/sn2mm.py makes the SN files; the BN and GN
# ResNet-50 are the names mmdet's own configs use, which mmengine loads
# from torch's hub cache (downloading them there where it may).
sn_8x2_checkpoint = 'checkpoints/resnet50_sn_8x2_mm.pth'
bn_checkpoint = 'torchvision://resnet50'
gn_checkpoint = 'open-mmlab://detectron/resnet50_gn'
sn_8x4_checkpoint = 'checkpoints/resnet50_sn_8x4_mm.pth'
sn_8x32_checkpoint = 'checkpoints/resnet50_sn_8x32_mm.pth'
# The strongest released SN backbones (the (8,32) setting), converted the
# same way; sn2mm.py detects v1/v2 and the depth.
sn_r101_8x32_checkpoint = 'checkpoints/resnet101_sn_8x32_mm.pth'
sn_preact_r50_8x32_checkpoint = 'checkpoints/resnet50v2_sn_8x32_mm.pth'
sn_preact_r101_8x32_checkpoint = 'checkpoints/resnet101v2_sn_8x32_mm.pth'
# Sparse SN (Shao et al., CVPR 2019): the released ResNet50v1+SSN (8,2), the
# paper's finetuning batch setting; sn2mm.py converts it (every layer fixed).
ssn_8x2_checkpoint = 'checkpoints/resnet50_ssn_8x2_mm.pth'
