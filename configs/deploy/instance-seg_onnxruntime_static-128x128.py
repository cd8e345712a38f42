# mmdeploy 1.3.1 deploy config (its format): an mmdet instance segmenter
# (Mask R-CNN) to ONNX, end to end, for its ONNX Runtime backend, at a fixed
# 128 x 128 input: the detection config with the masks as a third output.
# RoIAlign exports as mmdeploy's MMCVMultiLevelRoiAlign, which its ONNX
# Runtime custom-op library (in the mmdeploy wheel) runs.
_base_ = ['./detection_onnxruntime_static-128x128.py']
onnx_config = dict(output_names=['dets', 'labels', 'masks'])
codebase_config = dict(post_processing=dict(export_postprocess_mask=False))
