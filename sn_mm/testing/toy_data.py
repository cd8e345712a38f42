"""Deterministic toy datasets of coloured shapes, generated locally.

They let the demos and tests train real classifiers, detectors and
segmentors without downloading anything: COCO-format instances (boxes and
polygon masks) under ``data/toy_coco``, ADE20K-style images with label PNGs
under ``data/toy_seg``, and one shape per image in class folders (the layout
of mmpretrain's ``CustomDataset``) under ``data/toy_cls``.
"""
import json
import math
import os
import os.path as osp

import cv2
import numpy as np

# Each class has its own shape and a base colour (BGR) that is jittered per
# instance, so a small network learns them in minutes on a CPU.
SHAPE_CLASSES = ('square', 'circle', 'triangle', 'star')
BASE_COLOURS = ((40, 40, 220), (40, 200, 40), (220, 60, 40), (30, 200, 230))


def _shape_polygon(kind, cx, cy, r, angle):
    """Vertices (K, 2) of a shape of circumradius ``r`` around (cx, cy)."""
    if kind == 'square':
        t = angle + np.arange(4) * math.pi / 2 + math.pi / 4
        radii = np.full(4, r)
    elif kind == 'circle':
        t = np.linspace(0, 2 * math.pi, 32, endpoint=False)
        radii = np.full(32, r)
    elif kind == 'triangle':
        t = angle + np.arange(3) * 2 * math.pi / 3
        radii = np.full(3, r)
    elif kind == 'star':
        t = angle + np.arange(10) * math.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, r, r * 0.45)
    else:
        raise ValueError(f'unknown shape {kind!r}')
    return np.stack([cx + radii * np.cos(t), cy + radii * np.sin(t)], 1)


def _colour(rng, index):
    """Base colour ``index`` jittered by up to 30 per channel, as cv2 takes
    a fill colour."""
    jittered = np.array(BASE_COLOURS[index]) + rng.integers(-30, 31, size=3)
    return tuple(float(c) for c in np.clip(jittered, 0, 255))


def _background(rng, size):
    base = rng.integers(90, 170, size=3)
    img = np.empty((size, size, 3), np.float32)
    img[:] = base
    img += rng.normal(0, 12, size=(size, size, 3))
    return img


def render_image(rng, size, max_objects, min_radius, max_radius):
    """An image and its non-overlapping instances ``(class_index, polygon)``.
    Shapes are placed by rejection so every mask is fully visible."""
    img = _background(rng, size)
    # Small images get proportionally smaller shapes.
    max_radius = min(max_radius, size / 2 - 2)
    min_radius = min(min_radius, max_radius)
    placed = []  # (cx, cy, r)
    instances = []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            r = float(rng.uniform(min_radius, max_radius))
            cx, cy = rng.uniform(r + 1, size - r - 1, size=2)
            if all(
                    math.hypot(cx - x, cy - y) > r + rr + 2
                    for x, y, rr in placed):
                break
        else:
            continue
        label = int(rng.integers(len(SHAPE_CLASSES)))
        poly = _shape_polygon(SHAPE_CLASSES[label], cx, cy, r,
                              float(rng.uniform(0, 2 * math.pi)))
        cv2.fillPoly(img, [np.round(poly).astype(np.int32)],
                     _colour(rng, label))
        placed.append((cx, cy, r))
        instances.append((label, poly))
    return np.clip(img, 0, 255).astype(np.uint8), instances


def make_toy_coco(root,
                  num_train=400,
                  num_val=100,
                  size=128,
                  max_objects=4,
                  min_radius=10,
                  max_radius=30,
                  seed=0):
    """Write ``root/{train,val}/*.png`` and ``root/annotations/
    instances_{train,val}.json`` in COCO format. Deterministic in ``seed``."""
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    categories = [
        dict(id=i + 1, name=n, supercategory='shape')
        for i, n in enumerate(SHAPE_CLASSES)
    ]
    for split, count, split_seed in (('train', num_train, seed),
                                     ('val', num_val, seed + 1)):
        rng = np.random.default_rng(split_seed)
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, annotations = [], []
        for i in range(count):
            img, instances = render_image(rng, size, max_objects, min_radius,
                                          max_radius)
            file_name = f'{i:05d}.png'
            cv2.imwrite(osp.join(root, split, file_name), img)
            images.append(
                dict(id=i + 1, file_name=file_name, height=size, width=size))
            for label, poly in instances:
                mask = np.zeros((size, size), np.uint8)
                cv2.fillPoly(mask, [np.round(poly).astype(np.int32)], 1)
                ys, xs = np.nonzero(mask)
                x0, y0 = float(xs.min()), float(ys.min())
                w, h = float(xs.max() - x0 + 1), float(ys.max() - y0 + 1)
                annotations.append(
                    dict(
                        id=len(annotations) + 1,
                        image_id=i + 1,
                        category_id=label + 1,
                        bbox=[x0, y0, w, h],
                        area=float(mask.sum()),
                        iscrowd=0,
                        segmentation=[poly.round(2).ravel().tolist()]))
        with open(
                osp.join(root, 'annotations', f'instances_{split}.json'),
                'w') as f:
            json.dump(
                dict(
                    images=images,
                    annotations=annotations,
                    categories=categories), f)


def make_toy_seg(root,
                 num_train=300,
                 num_val=60,
                 size=96,
                 max_objects=4,
                 min_radius=10,
                 max_radius=28,
                 seed=0):
    """Write an ADE20K-style set: ``root/images/{training,validation}/*.png``
    and label PNGs under ``root/annotations/...``. As in ADE20K, 0 means
    "unlabelled" (ignored with ``reduce_zero_label=True``); 1 is the
    background and 2.. are the shape classes. Deterministic in ``seed``."""
    for split, count, split_seed in (('training', num_train, seed + 10),
                                     ('validation', num_val, seed + 11)):
        rng = np.random.default_rng(split_seed)
        img_dir = osp.join(root, 'images', split)
        ann_dir = osp.join(root, 'annotations', split)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        for i in range(count):
            img, instances = render_image(rng, size, max_objects, min_radius,
                                          max_radius)
            label = np.ones((size, size), np.uint8)
            for cls, poly in instances:
                cv2.fillPoly(label, [np.round(poly).astype(np.int32)], cls + 2)
            cv2.imwrite(osp.join(img_dir, f'{i:05d}.png'), img)
            cv2.imwrite(osp.join(ann_dir, f'{i:05d}.png'), label)


def make_toy_cls(root,
                 num_train=800,
                 num_val=200,
                 size=64,
                 min_radius=10,
                 max_radius=28,
                 seed=0):
    """Write ``root/{train,val}/<class>/*.png``: one shape per image, the
    classes of the detection set, for pretraining a backbone that the toy
    detectors then start from. Each shape takes any class's colour, so that
    the classifier must learn shapes, not colours. Deterministic in
    ``seed``."""
    for split, count, split_seed in (('train', num_train, seed + 20),
                                     ('val', num_val, seed + 21)):
        rng = np.random.default_rng(split_seed)
        for name in SHAPE_CLASSES:
            os.makedirs(osp.join(root, split, name), exist_ok=True)
        for i in range(count):
            label = i % len(SHAPE_CLASSES)
            img = _background(rng, size)
            r = float(
                rng.uniform(
                    min(min_radius, size / 4), min(max_radius, size / 2 - 2)))
            cx, cy = rng.uniform(r + 1, size - r - 1, size=2)
            poly = _shape_polygon(SHAPE_CLASSES[label], cx, cy, r,
                                  float(rng.uniform(0, 2 * math.pi)))
            cv2.fillPoly(img, [np.round(poly).astype(np.int32)],
                         _colour(rng, rng.integers(len(BASE_COLOURS))))
            cv2.imwrite(
                osp.join(root, split, SHAPE_CLASSES[label], f'{i:05d}.png'),
                np.clip(img, 0, 255).astype(np.uint8))


# The toy video classes: the direction a shape moves in. One frame shows
# where a shape is, not where it goes, so only time tells them apart.
MOTION_CLASSES = ('right', 'left', 'down', 'up')
_STEPS = {'right': (1, 0), 'left': (-1, 0), 'down': (0, 1), 'up': (0, -1)}


def make_toy_video(root, num_train=320, num_val=80, size=32, frames=8, seed=0):
    """Write clips of one moving shape as frame folders, mmaction2's
    ``RawframeDataset`` layout: ``root/rawframes/<split>/<clip>/
    img_00001.png ...`` and ``root/<split>_list.txt`` with lines ``<split>/
    <clip> <frames> <label>``. A clip's class is its shape's direction of
    motion (``MOTION_CLASSES``); shape, colour, start and speed are random,
    so that no single frame tells the class. Deterministic in ``seed``."""
    for split, count, split_seed in (('train', num_train, seed + 30),
                                     ('val', num_val, seed + 31)):
        rng = np.random.default_rng(split_seed)
        lines = []
        for i in range(count):
            label = i % len(MOTION_CLASSES)
            dx, dy = _STEPS[MOTION_CLASSES[label]]
            r = float(rng.uniform(size / 8, size / 5))
            speed = float(rng.uniform(1.5, 2.5))
            travel = speed * (frames - 1)
            # Start where the whole path stays inside the frame.
            low = [r + 1 + (travel if d < 0 else 0) for d in (dx, dy)]
            high = [size - r - 1 - (travel if d > 0 else 0) for d in (dx, dy)]
            cx, cy = (float(rng.uniform(lo, hi)) for lo, hi in zip(low, high))
            kind = SHAPE_CLASSES[rng.integers(len(SHAPE_CLASSES))]
            angle = float(rng.uniform(0, 2 * math.pi))
            colour = _colour(rng, rng.integers(len(BASE_COLOURS)))
            background = _background(rng, size)
            clip = f'{split}/{i:05d}'
            os.makedirs(osp.join(root, 'rawframes', clip), exist_ok=True)
            for t in range(frames):
                img = background.copy()
                poly = _shape_polygon(kind, cx + dx * speed * t,
                                      cy + dy * speed * t, r, angle)
                cv2.fillPoly(img, [np.round(poly).astype(np.int32)], colour)
                cv2.imwrite(
                    osp.join(root, 'rawframes', clip, f'img_{t + 1:05d}.png'),
                    np.clip(img, 0, 255).astype(np.uint8))
            lines.append(f'{clip} {frames} {label}')
        with open(osp.join(root, f'{split}_list.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')
