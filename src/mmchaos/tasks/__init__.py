"""Tasks: how a target is scored on a dataset, and which task fits which perturbed modality."""

from __future__ import annotations

from mmchaos.data.base import Dataset
from mmchaos.registry import Registry
from mmchaos.targets.base import Target
from mmchaos.tasks.base import Task, TaskResult

__all__ = ["REGISTRY", "Task", "TaskResult", "default_task"]

REGISTRY: Registry[type[Task]] = Registry("task", "mmchaos.tasks")
for _name, _spec in {
    "zero_shot": "mmchaos.tasks.embedding:ZeroShotClassification",
    "retrieval_t2i": "mmchaos.tasks.embedding:TextToImageRetrieval",
    "retrieval_i2t": "mmchaos.tasks.embedding:ImageToTextRetrieval",
    "ocr": "mmchaos.tasks.ocr:OCRTask",
    "vqa": "mmchaos.tasks.generative:VQAAccuracy",
    "vlm_ocr": "mmchaos.tasks.generative:GenerativeOCR",
    "caption_cer": "mmchaos.tasks.generative:CaptionCER",
    "frames_vqa": "mmchaos.tasks.frames:FramesVQA",
    "grounding": "mmchaos.tasks.grounding:Grounding",
    "document_qa": "mmchaos.tasks.documents:DocumentQA",
}.items():
    REGISTRY.register(_name, _spec)

# Preference order of tasks when the perturbed modality is image or text, or a multimodal
# perturbation moves frame sequences or boxes (a grounding set also answers as ``vqa``: grounding first;
# a documents set too: document_qa, which sends every page, before vqa, which would send one).
_PREFERENCE = {
    "image": ("ocr", "zero_shot", "retrieval_i2t", "grounding", "document_qa", "vqa", "vlm_ocr"),
    "text": ("retrieval_t2i", "grounding", "frames_vqa", "document_qa", "vqa"),
    "frames": ("frames_vqa",),
    "boxes": ("grounding",),
}


def default_task(modality: str, target: Target, dataset: Dataset) -> str | None:
    """The first task that scores a ``modality`` perturbation on this target and dataset."""
    for name in _PREFERENCE.get(modality, ()):
        if REGISTRY.get(name).supports(target, dataset):
            return name
    return None
