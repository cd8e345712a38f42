# `make test` and `make demo` create .venv/ on first use (10-30 minutes:
# mmcv 2.1.0 compiles from source); later runs reuse it and install nothing.
#
# Install order matters:
# 1. torch and torchvision first, pinned: the CUDA 13 builds, which run on
#    CPU-only machines too (torchvision, which mmpretrain imports, has no
#    build that imports beside the CPU torch 2.13), so nothing later pulls
#    another;
# 2. setuptools<70, wheel, ninja: mmcv 2.1.0's build imports pkg_resources;
# 3. mmcv built against that torch (--no-build-isolation; --no-cache-dir, so
#    that a wheel pip cached for another torch is not taken; C++20 through
#    tools/misc/cxx20, which torch 2.14's headers need);
# 4. the rest; this brings setuptools back up to what torch asks for;
# 5. openmim and mmaction2 without their dependencies (requirements/ lists
#    the ones they use): openmim's opendatalab -> openxlab chain pins
#    setuptools~=60.2 and requests~=2.28, which would undo step 4;
#    mmaction2's opencv-contrib-python would write a second cv2 over the
#    opencv-python that mmcv brings;
# 6. sn_mm itself, editable (pure Python), then its C++ CPU kernels, built
#    against that torch into torch's extensions cache (about a minute; what
#    a user's first SN call on a CPU does, sn_mm/ops/native.py).
PY        ?= python3
VENV      := .venv
VPY       := $(VENV)/bin/python
PIP       := $(VPY) -m pip
TORCH_VERSION ?= 2.14.1
TORCHVISION_VERSION ?= 0.29.1
# Written last: a .venv whose install broke half-way is completed next time.
STAMP     := $(VENV)/.sn_mm-installed

.PHONY: venv test demo demo-seg demo-pretrain demo-video clean-venv gpu-wheels gpu-check \
	venv-oldest test-oldest wheel-check wheel-check-oldest venv-triton-oldest \
	test-triton-oldest

DEMO_CONFIG := configs/toy/mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py
TOY_COCO    := data/toy_coco/annotations/instances_val.json
SEG_CONFIG  := configs/toy/deeplabv3_r18-sn-d8_toy-seg.py
TOY_SEG     := data/toy_seg/annotations/validation

venv: $(STAMP)

$(STAMP): requirements/build.txt requirements/runtime.txt requirements/tests.txt setup.py \
		pyproject.toml requirements/install.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install torch==$(TORCH_VERSION) torchvision==$(TORCHVISION_VERSION)
	$(PIP) install -r requirements/build.txt
	$(PIP) install mmengine==0.10.7
	CXX=$(CURDIR)/tools/misc/cxx20 MAX_JOBS=$${MAX_JOBS:-2} \
		$(PIP) install --no-build-isolation --no-cache-dir mmcv==2.1.0
	$(PIP) install -r requirements/runtime.txt -r requirements/tests.txt \
		torch==$(TORCH_VERSION) torchvision==$(TORCHVISION_VERSION)
	$(PIP) install --no-deps openmim==0.3.9 mmaction2==1.2.0
	$(PIP) install --no-build-isolation --no-deps -e .
	$(VPY) -c "from sn_mm.ops import native_status; print(native_status())"
	touch $(STAMP)

# Two workers (pytest-xdist), each test file on one: on a 2-core machine
# the suite's subprocesses and imports overlap; each worker runs torch on
# its share of the cores (tests/conftest.py).
test: venv
	$(VPY) -m pytest tests -n 2 --dist loadfile --durations=20

# The oldest supported stack, in .venv-oldest/: torch 2.1.2 on Python 3.8
# (pyenv's where it has one: its shim on PATH fails for a version that is
# not selected; else python3.8 on PATH), mmcv 2.1.0 built from
# source against it (what its prebuilt wheels pair), the same OpenMMLab
# versions, and mmdeploy 1.3.1 with ONNX Runtime 1.16.3. The same steps as
# .venv's; mmcv builds in C++17, which torch 2.1's headers take.
OLDEST_PY    ?= $(firstword \
	$(wildcard $(HOME)/.pyenv/versions/3.8.*/bin/python3.8) \
	$(shell command -v python3.8))
OLDEST_VENV  := .venv-oldest
OLDEST_VPY   := $(OLDEST_VENV)/bin/python
OLDEST_STAMP := $(OLDEST_VENV)/.sn_mm-installed

venv-oldest: $(OLDEST_STAMP)

$(OLDEST_STAMP): requirements/oldest.txt requirements/tests-oldest.txt \
		requirements/build.txt requirements/runtime.txt setup.py \
		pyproject.toml requirements/install.txt
	@test -n "$(OLDEST_PY)" || { echo "no Python 3.8: set OLDEST_PY"; exit 1; }
	test -x $(OLDEST_VPY) || $(OLDEST_PY) -m venv $(OLDEST_VENV)
	$(OLDEST_VPY) -m pip install -q --upgrade 'pip<25'
	$(OLDEST_VPY) -m pip install -r requirements/oldest.txt
	$(OLDEST_VPY) -m pip install -r requirements/build.txt -r requirements/oldest.txt
	$(OLDEST_VPY) -m pip install mmengine==0.10.7 -r requirements/oldest.txt
	MAX_JOBS=$${MAX_JOBS:-2} $(OLDEST_VPY) -m pip install --no-build-isolation \
		--no-cache-dir mmcv==2.1.0 -r requirements/oldest.txt
	$(OLDEST_VPY) -m pip install -r requirements/tests-oldest.txt -r requirements/oldest.txt
	$(OLDEST_VPY) -m pip install --no-deps openmim==0.3.9 mmaction2==1.2.0
	$(OLDEST_VPY) -m pip install --no-build-isolation --no-deps -e .
	$(OLDEST_VPY) -c "from sn_mm.ops import native_status; print(native_status())"
	touch $(OLDEST_STAMP)

# The second CI leg: the whole suite on the oldest supported stack; tests
# that need a newer torch skip, naming it (-rs lists them).
test-oldest: venv-oldest
	$(OLDEST_VPY) -m pytest tests -n 2 --dist loadfile --durations=20 -rfEs

# The third CI leg: what differs with Triton, on the oldest Triton the fused
# kernels support (3.0, torch 2.4.1) in .venv-triton-oldest/: the fused
# kernels and SyncSN's in Triton's interpreter, the compile check's
# cross-section (every architecture this Triton targets) and the
# self-check of GPUs whose architecture or dtype it refuses. The rest of
# the suite does not change with Triton: the main leg runs it.
TRITON_OLDEST_PY    ?= $(PY)
TRITON_OLDEST_VENV  := .venv-triton-oldest
TRITON_OLDEST_VPY   := $(TRITON_OLDEST_VENV)/bin/python
TRITON_OLDEST_STAMP := $(TRITON_OLDEST_VENV)/.sn_mm-installed
TRITON_TESTS        := tests/test_triton_fused.py tests/test_sync_sn_triton.py

venv-triton-oldest: $(TRITON_OLDEST_STAMP)

$(TRITON_OLDEST_STAMP): requirements/triton-oldest.txt setup.py pyproject.toml \
		requirements/install.txt
	test -x $(TRITON_OLDEST_VPY) || $(TRITON_OLDEST_PY) -m venv $(TRITON_OLDEST_VENV)
	$(TRITON_OLDEST_VPY) -m pip install -q --upgrade pip
	$(TRITON_OLDEST_VPY) -m pip install -r requirements/triton-oldest.txt
	$(TRITON_OLDEST_VPY) -m pip install --no-build-isolation --no-deps -e .
	touch $(TRITON_OLDEST_STAMP)

test-triton-oldest: venv-triton-oldest
	$(TRITON_OLDEST_VPY) -m pytest $(TRITON_TESTS) -n 2 --dist loadfile -rfEs

# sn_mm as a user installs it into an existing environment: a wheel built
# under pip's build isolation, installed into a fresh venv that sees the
# leg's torch and OpenMMLab but not its sn_mm, its kernels built into an
# empty cache and the agreement tests run on it, with every compiler given
# in WHEEL_COMPILERS as well (tools/misc/wheel_check.py; .ci/run installs
# g++-11 and clang++-16 and names them).
WHEEL_COMPILERS ?=
wheel-check: venv
	$(VPY) tools/misc/wheel_check.py --env $(VPY) --compilers $(WHEEL_COMPILERS)

wheel-check-oldest: venv-oldest
	$(OLDEST_VPY) tools/misc/wheel_check.py --env $(OLDEST_VPY)

# The main job: train Mask R-CNN with SN everywhere on the toy data, print
# COCO bbox/segm AP, then draw the learned ratios of every SN layer.
demo: venv $(TOY_COCO)
	$(VPY) tools/train.py $(DEMO_CONFIG) --work-dir work_dirs/demo
	$(VPY) tools/analysis_tools/plot_ratios.py "$$(cat work_dirs/demo/last_checkpoint)" \
		--out work_dirs/demo/sn_ratios.png

$(TOY_COCO): | venv
	$(VPY) tools/misc/make_toy_data.py coco --out data/toy_coco

# Train DeepLabV3 with SN on the toy segmentation data, print mIoU.
demo-seg: venv $(TOY_SEG)
	$(VPY) tools/train.py $(SEG_CONFIG) --work-dir work_dirs/demo-seg

$(TOY_SEG): | venv
	$(VPY) tools/misc/make_toy_data.py seg --out data/toy_seg

# Pretrain an SN ResNet-18 with mmpretrain on generated shape images, then
# finetune the toy Mask R-CNN from its checkpoint; prints the classifier's
# accuracy and the detector's COCO AP (about 4 minutes on 2 cores).
PRETRAIN_CONFIG := configs/toy/resnet18-sn_toy-cls.py
FINETUNE_CONFIG := configs/toy/mask-rcnn_r18-sn-pretrained_fpn_sn-head_toy-coco.py
TOY_CLS         := data/toy_cls/val
demo-pretrain: venv $(TOY_CLS) $(TOY_COCO)
	$(VPY) tools/train.py $(PRETRAIN_CONFIG) --work-dir work_dirs/demo-pretrain/cls
	$(VPY) tools/train.py $(FINETUNE_CONFIG) --work-dir work_dirs/demo-pretrain/det \
		--cfg-options model.backbone.init_cfg.checkpoint="$$(cat work_dirs/demo-pretrain/cls/last_checkpoint)"
	@echo "pretrained classifier: $$(grep -ho 'accuracy/top1: [0-9.]*' work_dirs/demo-pretrain/cls/*/*.log | tail -n 1)"
	@echo "finetuned detector: $$(grep -ho 'bbox_mAP: [0-9.]*' work_dirs/demo-pretrain/det/*/*.log | tail -n 1), $$(grep -ho 'segm_mAP: [0-9.]*' work_dirs/demo-pretrain/det/*/*.log | tail -n 1)"

$(TOY_CLS): | venv
	$(VPY) tools/misc/make_toy_data.py cls --out data/toy_cls

# The paper's video experiment at toy size: an I3D ResNet-18 with SN in every
# norm layer (mmaction2) learns the direction a shape moves in from generated
# 8-frame clips; prints top-1 and draws the learned ratios (under a minute
# on 2 cores).
VIDEO_CONFIG := configs/toy/i3d_r18-sn_toy-video.py
TOY_VIDEO    := data/toy_video/val_list.txt
demo-video: venv $(TOY_VIDEO)
	$(VPY) tools/train.py $(VIDEO_CONFIG) --work-dir work_dirs/demo-video
	$(VPY) tools/analysis_tools/plot_ratios.py "$$(cat work_dirs/demo-video/last_checkpoint)" \
		--out work_dirs/demo-video/sn_ratios.png
	@echo "toy video, top-1: $$(grep -ho 'acc/top1: [0-9.]*' work_dirs/demo-video/*/*.log | tail -n 1)"

$(TOY_VIDEO): | venv
	$(VPY) tools/misc/make_toy_data.py video --out data/toy_video

clean-venv:
	rm -rf $(VENV)

# The GPU check (tools/misc/gpu_check.py). A GPU machine without a package
# registry gets mmengine and the pure-Python packages its image lacks as
# wheels: `make gpu-wheels` here (registry access) fills gpu_wheels/, which
# travels with the working tree; `make gpu-check` there installs them into a
# temporary folder and runs the check with the machine's own python3 (here,
# with .venv's, where the check runs its CPU parts).
GPU_WHEELS := mmengine==0.10.7 addict==2.4.0 yapf==0.43.0 \
	platformdirs==4.14.8 termcolor==3.3.0
GPU_PY     := $(shell test -x $(VPY) && echo $(VPY) || echo python3)

gpu-wheels:
	$(PY) -m pip download -q --no-deps --only-binary=:all: \
		--python-version 3.12 --implementation cp \
		--platform manylinux2014_x86_64 -d gpu_wheels $(GPU_WHEELS)

gpu-check:
	$(GPU_PY) tools/misc/gpu_check.py --wheels gpu_wheels
