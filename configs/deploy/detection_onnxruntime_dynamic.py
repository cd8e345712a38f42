# mmdeploy 1.3.1 deploy config (its format): an mmdet detector to ONNX, end
# to end, for its ONNX Runtime backend, any batch size and image size (the
# input's axes 0, 2 and 3 and the detections' count are dynamic); otherwise
# ./detection_onnxruntime_static-128x128.py. Use: docs/deployment.md.
_base_ = ['./detection_onnxruntime_static-128x128.py']
onnx_config = dict(
    input_shape=None,
    dynamic_axes=dict(
        input=dict({
            0: 'batch',
            2: 'height',
            3: 'width'
        }),
        dets=dict({
            0: 'batch',
            1: 'num_dets'
        }),
        labels=dict({
            0: 'batch',
            1: 'num_dets'
        })))
