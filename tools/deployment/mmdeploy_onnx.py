#!/usr/bin/env python
"""Deploy an mmdet detector or an mmseg segmentor with SN (or SW) layers as
OpenMMLab users deploy: mmdeploy's ``torch2onnx`` to an end-to-end ONNX
file, then its ONNX Runtime backend, checked against PyTorch on the given
images (of one size for a static deploy config, of any for a dynamic one).

Identity nodes that copy an initializer (the exporter's for bit-identical
parameters, e.g. untrained SN weights) are folded away, as ONNX Runtime
1.16 refuses them. Prints the exported file's operators (SN and SW layers
export as standard ONNX operators; where mmdeploy needs its own custom ops,
the custom-op library of its wheel runs them), then compares a detector's
outputs, for each image:

1. the exported graph in ONNX Runtime against the PyTorch model it was
   traced from (mmdeploy's rewrites applied), output by output: the same
   labels, boxes within ``--box-rtol`` of their coordinates (at least a
   pixel's worth), mask probabilities (28 x 28) within ``--mask-atol`` and
   masks at 0.5 of IoU above ``--mask-iou`` over the pixels clear of 0.5
   by that much (a briefly trained mask head's probabilities lie near 0.5,
   where rounding decides the side);
2. ONNX Runtime's detections (mmdeploy's backend model) against mmdet's own
   PyTorch ``predict``, matched one to one by label, box and mask.

A segmentor (a deploy config of mmdeploy's mmseg codebase, with
``with_argmax=False``) is compared by its logits against mmseg's own
``predict``: within ``--logit-rtol`` of their largest magnitude, and class
maps equal on at least ``--pixels`` of the pixels.

Only detections that rank clear (by ``--score-margin``) of the score
threshold, and of the last kept score where ``keep_top_k`` detections fill
an image's output, are required in both: scores within rounding of either
edge may be kept on one side only. A comparison without a single
detection counts as a failure; ``--cfg-options
model.test_cfg.rcnn.score_thr=...`` lowers a briefly trained detector's
threshold. A two-stage detector's second comparison is reported, not
required to agree: mmdeploy's RPN rewrite suppresses the proposals of all
FPN levels together where mmdet's suppresses each level's, so the
proposals, and the detections, differ for any norm layer.

Exits non-zero, naming the image and detection, where a required
comparison disagrees.

Needs mmdeploy 1.3.1 with ONNX Runtime 1.16 (``make venv-oldest`` installs
them beside torch 2.1.2; docs/deployment.md).

Example::

    python tools/deployment/mmdeploy_onnx.py \\
        configs/deploy/instance-seg_onnxruntime_static-128x128.py \\
        configs/toy/mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py \\
        work_dirs/demo/iter_100.pth data/toy_coco/val/000000.png \\
        --work-dir work_dirs/deploy
"""
import argparse
import os.path as osp
import sys

import torch
from mmengine.config import DictAction

import sn_mm  # noqa: F401  (registers SN, SW and SWResNet)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Convert an mmdet detector or mmseg segmentor with SN/SW '
        'layers to ONNX with mmdeploy and check its ONNX Runtime outputs '
        'against PyTorch\'s.')
    parser.add_argument('deploy_cfg', help='mmdeploy deploy config')
    parser.add_argument('model_cfg', help='the model\'s config')
    parser.add_argument('checkpoint', help='the model\'s checkpoint')
    parser.add_argument(
        'images', nargs='+', help='images to convert with and compare on')
    parser.add_argument(
        '--work-dir', required=True, help='where the ONNX file goes')
    parser.add_argument('--device', default='cpu')
    parser.add_argument(
        '--box-rtol',
        type=float,
        default=1e-3,
        help='box coordinates within this fraction of their value '
        '(default: 1e-3)')
    parser.add_argument(
        '--mask-iou',
        type=float,
        default=0.99,
        help='least IoU of matched masks (default: 0.99)')
    parser.add_argument(
        '--mask-atol',
        type=float,
        default=1e-3,
        help='most that matched mask probabilities of the exported graph '
        'and its PyTorch model may differ by; pixels this close to 0.5 are '
        'left out of the IoU (default: 1e-3)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        default={},
        help='override settings of the detector\'s config (as tools/'
        'train.py does), e.g. model.test_cfg.rcnn.score_thr=0.01 to compare '
        'more detections of a briefly trained model')
    parser.add_argument(
        '--logit-rtol',
        type=float,
        default=1e-3,
        help='segmentors: most that logits may differ by, as a fraction of '
        'their largest magnitude (at least 1) (default: 1e-3)')
    parser.add_argument(
        '--pixels',
        type=float,
        default=0.999,
        help='segmentors: least fraction of pixels whose classes agree '
        '(default: 0.999)')
    parser.add_argument(
        '--score-margin',
        type=float,
        default=1e-3,
        help='how far above the score threshold and the last kept score a '
        'detection must rank to be required in both (default: 1e-3)')
    return parser.parse_args(argv)


def standard_onnx(path):
    """The exported graph's operators, and those outside ONNX's own domain
    that are not mmdeploy's (a Python op, an sn_mm op: what SN or SW would
    leave if it did not export as standard operators)."""
    import onnx
    nodes = onnx.load(path).graph.node
    ops = sorted({(n.domain or 'ai.onnx', n.op_type) for n in nodes})
    foreign = [(d, op) for d, op in ops
               if d not in ('ai.onnx', 'mmdeploy') or 'Python' in op]
    return ops, foreign


def fold_identity_initializers(path) -> int:
    """Rewrite the ONNX file at ``path`` without Identity nodes that copy an
    initializer (each consumer reads the initializer itself); returns how
    many were removed.

    PyTorch's exporter keeps one initializer of several bit-identical ones
    (two SN layers' untrained weights, all 1.0) and feeds the others'
    consumers through such an Identity. The file is valid ONNX, but ONNX
    Runtime 1.16's graph optimiser loses those Identities' outputs and
    refuses the model ("Node input ... is not a graph input, initializer, or
    output of a previous node")."""
    import onnx
    model = onnx.load(path)
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    renamed, kept = {}, []
    for node in graph.node:  # in topological order: chains fold too
        for i, name in enumerate(node.input):
            node.input[i] = renamed.get(name, name)
        if (node.op_type == 'Identity' and node.input[0] in initializers
                and node.output[0] not in outputs):
            renamed[node.output[0]] = node.input[0]
        else:
            kept.append(node)
    if renamed:
        del graph.node[:]
        graph.node.extend(kept)
        onnx.save(model, path)
    return len(renamed)


def detections(sample):
    """(boxes (N, 4), scores (N), labels (N), masks (N, H, W) or None) of
    a DetDataSample's predictions, on the CPU, without boxes of zero width
    or height: mmdet drops those before its NMS (``min_bbox_size``),
    mmdeploy's end-to-end graph keeps them."""
    pred = sample.pred_instances
    boxes = pred.bboxes.detach().cpu().double()
    keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    masks = pred.masks.cpu().bool()[keep] if 'masks' in pred else None
    return (boxes[keep], pred.scores.detach().cpu().double()[keep],
            pred.labels.cpu()[keep], masks)


def mask_problem(want, got, mask_iou, mask_atol):
    """What is wrong with mask ``got`` against ``want`` (None: nothing).
    Boolean masks: their IoU. Probabilities: they differ by at most
    ``mask_atol``, and the masks at 0.5 have their IoU over the pixels
    where neither lies within ``mask_atol`` of 0.5."""
    clear = torch.ones_like(want, dtype=torch.bool)
    if want.is_floating_point():
        diff = float((want - got).abs().max()) if want.numel() else 0.
        if diff > mask_atol:
            return f'mask probabilities differ by {diff:.2e}'
        clear = ((want - 0.5).abs() > mask_atol) & (
            (got - 0.5).abs() > mask_atol)
        want, got = want >= 0.5, got >= 0.5
    inter = (want & got & clear).sum().item()
    union = ((want | got) & clear).sum().item()
    iou = inter / union if union else 1.
    return f'mask IoU {iou:.4f}' if iou <= mask_iou else None


def compare(want, got, args, keep_top_k, score_thr=0.):
    """Problems, and the number of matched detections: every detection of
    ``want`` (PyTorch's) that ranks clear of the score threshold and of the
    keep_top_k cut (0: no cut) by ``args.score_margin`` has one in ``got``
    (the backend's) with its label, box and mask; and the other way
    round."""
    box_rtol, score_margin = args.box_rtol, args.score_margin
    problems = []
    (wb, ws, wl, wm), (gb, gs, gl, gm) = want, got
    # A score within rounding of the threshold may be kept on one side only.
    floor = score_thr + score_margin if score_thr else 0.
    for scores in (ws, gs):
        if keep_top_k and len(scores) >= keep_top_k:  # full: cut at a score
            floor = max(floor, float(scores.min()) + score_margin)
    required = [i for i in range(len(ws)) if ws[i] > floor]
    taken = set()
    for i in required:
        tol = box_rtol * wb[i].abs().clamp(min=1.)
        close = [
            j for j in range(len(gs))
            if j not in taken and gl[j] == wl[i] and bool((
                (gb[j] - wb[i]).abs() <= tol).all())
        ]
        if not close:
            problems.append(f'detection {i} (label {int(wl[i])}, score '
                            f'{float(ws[i]):.4f}, box {wb[i].tolist()}) has '
                            'no match')
            continue
        j = min(close, key=lambda k: float((gb[k] - wb[i]).abs().max()))
        taken.add(j)
        if wm is not None:
            problem = mask_problem(wm[i], gm[j], args.mask_iou, args.mask_atol)
            if problem:
                problems.append(f'detection {i}: {problem}')
    extra = [j for j in range(len(gs)) if j not in taken and gs[j] > floor]
    if extra:
        problems.append(f'{len(extra)} backend detections above the cut '
                        f'without a match (e.g. {gb[extra[0]].tolist()})')
    return problems, len(taken)


def traced_outputs(processor, deploy_cfg, checkpoint, image, shape):
    """The input tensor and the outputs (dets, labels[, masks]) of the
    PyTorch model under mmdeploy's ONNX rewrites: what the export traced."""
    from mmdeploy.core import RewriterContext, patch_model
    from mmdeploy.utils import IR
    model = processor.build_pytorch_model(checkpoint)
    data, inputs = processor.create_input(
        image, shape, data_preprocessor=model.data_preprocessor)
    if isinstance(inputs, list) and len(inputs) == 1:
        inputs = inputs[0]
    patched = patch_model(
        model, cfg=deploy_cfg, backend='onnxruntime', ir=IR.ONNX)
    with RewriterContext(
            cfg=deploy_cfg,
            backend='onnxruntime',
            ir=IR.ONNX,
            opset=deploy_cfg.onnx_config.opset_version), torch.no_grad():
        outputs = patched(
            inputs, data_samples=data['data_samples'], mode='predict')
    return inputs, outputs


def raw_detections(dets, labels, masks=None):
    """(boxes, scores, labels, mask probabilities or None) of the first
    image of the exported graph's outputs."""
    dets = dets[0].detach().cpu().double()
    return (dets[:, :4], dets[:, 4], labels[0].cpu(),
            None if masks is None else masks[0].detach().cpu().double())


def has_rpn(model_cfg) -> bool:
    return 'rpn_head' in model_cfg.model


def score_threshold(model_cfg, deploy_cfg) -> float:
    """The score below which the detector drops detections: its test_cfg's
    (the R-CNN stage's for a two-stage one), as mmdeploy's rewrites read it,
    else the deploy config's."""
    test_cfg = model_cfg.model.get('test_cfg', {})
    test_cfg = test_cfg.get('rcnn', test_cfg)
    post = deploy_cfg.codebase_config.post_processing
    return float(test_cfg.get('score_thr', post.score_threshold))


def report(name, problems, matched, want, got, required=True):
    print(f'  {name}: PyTorch {len(want[1])} detections, ONNX Runtime '
          f'{len(got[1])}, {matched} matched' +
          ('' if problems else ', all agree'))
    for problem in problems[:10]:
        print(f'    {problem}')
    return required and (bool(problems) or not matched)


def repeats(backend, x, first) -> bool:
    """Whether ONNX Runtime gives ``first`` (its outputs for ``x``) again:
    ONNX Runtime 1.16.3 to 1.18.0 plan their memory on a session's first
    run (``enable_mem_pattern``), and on some graphs (a toy FCOS with SN)
    that plan corrupts a buffer, so that later runs differ. Says so where
    it does not."""
    with torch.no_grad():
        again = backend.wrapper({'input': x})
    same = all(torch.equal(first[name], again[name]) for name in first)
    if not same:
        print('  ONNX Runtime gave other outputs on a second run of the same '
              'input (its memory pattern, planned on the first run, which '
              'ONNX Runtime 1.16.3 to 1.18.0 get wrong on some graphs; '
              'ONNX Runtime >= 1.19, or a session with SessionOptions.'
              'enable_mem_pattern = False, repeats itself): DISAGREE')
    return same


def check_detections(processor, backend, pytorch, deploy_cfg, model_cfg,
                     args) -> bool:
    """The two comparisons of the module docstring on every image; True
    where a required one disagrees."""
    from mmdeploy.utils import get_input_shape
    shape = get_input_shape(deploy_cfg)
    keep_top_k = deploy_cfg.codebase_config.post_processing.keep_top_k
    score_thr = score_threshold(model_cfg, deploy_cfg)
    names = deploy_cfg.onnx_config.output_names
    two_stage = has_rpn(model_cfg)
    failed = False
    for image in args.images:
        x, traced = traced_outputs(processor, deploy_cfg, args.checkpoint,
                                   image, shape)
        print(f'{osp.basename(image)} {tuple(x.shape[2:])}')
        with torch.no_grad():
            run = backend.wrapper({'input': x})
        failed |= not repeats(backend, x, run)
        want = raw_detections(*traced)
        got = raw_detections(*(run[name] for name in names))
        failed |= report(
            'the exported graph against the model it was traced from',
            *compare(want, got, args, keep_top_k, score_thr), want, got)
        inputs, _ = processor.create_input(image, shape)
        with torch.no_grad():
            want = detections(pytorch.test_step(inputs)[0])
            got = detections(backend.test_step(inputs)[0])
        failed |= report(
            'ONNX Runtime\'s detections against mmdet\'s predict' +
            (' (reported: mmdeploy\'s RPN differs)' if two_stage else ''),
            *compare(want, got, args, keep_top_k, score_thr),
            want,
            got,
            required=not two_stage)
    return failed


def check_segmentation(processor, backend, pytorch, deploy_cfg, args) -> bool:
    """A segmentor's logits (the deploy config's ``with_argmax=False``)
    from ONNX Runtime against mmseg's own predict on every image: within
    ``--logit-rtol`` of the logits' largest magnitude (at least 1), and the
    class maps equal on at least ``--pixels`` of the pixels; True where one
    disagrees."""
    from mmdeploy.utils import get_input_shape
    if deploy_cfg.codebase_config.get('with_argmax', True):
        sys.exit('mmdeploy_onnx: a segmentation deploy config needs '
                 'codebase_config.with_argmax=False, so that the logits '
                 'are compared')
    shape = get_input_shape(deploy_cfg)
    failed = False
    for image in args.images:
        _, x = processor.create_input(
            image, shape, data_preprocessor=pytorch.data_preprocessor)
        inputs, _ = processor.create_input(image, shape)  # not preprocessed
        with torch.no_grad():
            run = backend.wrapper({'input': x})
        failed |= not repeats(backend, x, run)
        got = run['output'][0]
        with torch.no_grad():
            want = pytorch.test_step(inputs)[0].seg_logits.data
        # mmseg's predict leaves out the padding at the bottom and right.
        got = got[:, :want.shape[1], :want.shape[2]]
        scale = max(float(want.abs().max()), 1.)
        worst = float((got - want).abs().max()) / scale
        same = float((got.argmax(0) == want.argmax(0)).float().mean())
        bad = worst > args.logit_rtol or same < args.pixels
        failed |= bad
        print(f'{osp.basename(image)} {tuple(x.shape[2:])}: logits differ '
              f'by {worst:.2e} of their scale {scale:.3g}, class maps equal '
              f'on {same:.4%} of {want.shape[1] * want.shape[2]} pixels' +
              (' DISAGREE' if bad else ', agree'))
    return failed


def main(argv=None):
    args = parse_args(argv)
    try:
        from mmdeploy.apis import build_task_processor, torch2onnx
        from mmdeploy.utils import load_config
    except ImportError as err:
        sys.exit(f'mmdeploy_onnx: {err}: needs mmdeploy 1.3.1 and '
                 'onnxruntime 1.16 (make venv-oldest; docs/deployment.md)')
    deploy_cfg, model_cfg = load_config(args.deploy_cfg, args.model_cfg)
    model_cfg.merge_from_dict(args.cfg_options)
    save_file = deploy_cfg.onnx_config.save_file
    onnx_path = osp.join(args.work_dir, save_file)
    torch2onnx(args.images[0], args.work_dir, save_file, deploy_cfg, model_cfg,
               args.checkpoint, args.device)
    folded = fold_identity_initializers(onnx_path)
    if folded:
        print(f'Folded {folded} Identity nodes of bit-identical parameters '
              'into their initializers (ONNX Runtime 1.16 refuses them)')
    ops, foreign = standard_onnx(onnx_path)
    print(f'Exported {args.model_cfg} to {onnx_path}: ' +
          ', '.join(op if d == 'ai.onnx' else f'{d}::{op}' for d, op in ops))
    if foreign:
        sys.exit(f'mmdeploy_onnx: operators outside ONNX and mmdeploy: '
                 f'{foreign}')
    processor = build_task_processor(model_cfg, deploy_cfg, args.device)
    backend = processor.build_backend_model([onnx_path])
    pytorch = processor.build_pytorch_model(args.checkpoint)
    if deploy_cfg.codebase_config.type == 'mmseg':
        failed = check_segmentation(processor, backend, pytorch, deploy_cfg,
                                    args)
    else:
        failed = check_detections(processor, backend, pytorch, deploy_cfg,
                                  model_cfg, args)
    if failed:
        sys.exit('mmdeploy_onnx: ONNX Runtime disagrees with PyTorch '
                 '(above), or nothing was compared')
    print('ONNX Runtime agrees with PyTorch')


if __name__ == '__main__':
    main()
