# mmdeploy 1.3.1 deploy config (its format): an mmseg segmentor to ONNX for
# its ONNX Runtime backend, any batch size and image size (the graph's
# input and output axes 0, 2 and 3 are dynamic); the logits out, as in
# ./segmentation_onnxruntime_static-96x96.py. Use: docs/deployment.md.
_base_ = ['./segmentation_onnxruntime_static-96x96.py']
onnx_config = dict(
    input_shape=None,
    dynamic_axes=dict(
        input=dict({
            0: 'batch',
            2: 'height',
            3: 'width'
        }),
        output=dict({
            0: 'batch',
            2: 'height',
            3: 'width'
        })))
