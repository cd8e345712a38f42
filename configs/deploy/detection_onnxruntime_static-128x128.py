# mmdeploy 1.3.1 deploy config (its format): an mmdet detector to ONNX,
# end to end (backbone to NMS), for its ONNX Runtime backend, at a fixed
# 128 x 128 input (the toy configs' test size). SN layers export in eval
# mode as standard ONNX operators; NMS is ONNX's NonMaxSuppression.
# Use: tools/deployment/mmdeploy_onnx.py (docs/deployment.md).
onnx_config = dict(
    type='onnx',
    export_params=True,
    keep_initializers_as_inputs=False,
    opset_version=11,
    save_file='end2end.onnx',
    input_names=['input'],
    output_names=['dets', 'labels'],
    input_shape=[128, 128],
    optimize=True)
codebase_config = dict(
    type='mmdet',
    task='ObjectDetection',
    model_type='end2end',
    post_processing=dict(
        score_threshold=0.05,
        confidence_threshold=0.005,
        iou_threshold=0.5,
        max_output_boxes_per_class=200,
        pre_top_k=5000,
        keep_top_k=100,
        background_label_id=-1))
backend_config = dict(type='onnxruntime')
