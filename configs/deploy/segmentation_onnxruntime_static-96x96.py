# mmdeploy 1.3.1 deploy config (its format): an mmseg segmentor to ONNX, for
# its ONNX Runtime backend, at a fixed 96 x 96 input (the toy segmentation
# configs' size). The graph outputs the logits (with_argmax=False), which
# tools/deployment/mmdeploy_onnx.py compares with mmseg's; SN layers export
# in eval mode as standard ONNX operators. Use: docs/deployment.md.
onnx_config = dict(
    type='onnx',
    export_params=True,
    keep_initializers_as_inputs=False,
    opset_version=11,
    save_file='end2end.onnx',
    input_names=['input'],
    output_names=['output'],
    input_shape=[96, 96],
    optimize=True)
codebase_config = dict(type='mmseg', task='Segmentation', with_argmax=False)
backend_config = dict(type='onnxruntime')
