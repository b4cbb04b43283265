"""NonMaxSuppression (ONNX opsets 10, 11+): per batch and class, greedily keep the
highest-scoring boxes (ties: the lower index first), dropping each box whose IoU with a kept
one exceeds ``iou_threshold``, at most ``max_output_boxes_per_class`` (default 0: none), only
boxes scoring above ``score_threshold`` when it is given. Boxes are [y1, x1, y2, x2] (any
corner order) or, with ``center_point_box=1``, [x_center, y_center, width, height].
Output: (selected, 3) int64 rows [batch, class, box]. Not differentiable."""

from __future__ import annotations

import numpy as np

from meta.lv0 import Operator, register


def corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """(N, 4) boxes as [y_min, x_min, y_max, x_max]."""
    if center_point_box:
        x, y, w, h = boxes.T
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=1)
    y1, x1, y2, x2 = boxes.T
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2),
                     np.maximum(x1, x2)], axis=1)


def iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    """IoU of one box with each of ``others`` (corner form); 0 where an area is empty."""
    top = np.maximum(box[0], others[:, 0])
    left = np.maximum(box[1], others[:, 1])
    bottom = np.minimum(box[2], others[:, 2])
    right = np.minimum(box[3], others[:, 3])
    inter = np.clip(bottom - top, 0, None) * np.clip(right - left, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    valid = (inter > 0) & (area > 0) & (areas > 0) & (union > 0)
    return np.where(valid, inter / np.where(union > 0, union, 1), 0.0)


@register("NonMaxSuppression", since=10)
class NonMaxSuppression(Operator):
    """ONNX NonMaxSuppression-10: filter out boxes that have high intersection-over-union (IOU)
    overlap with previously selected boxes."""
    attributes = {"center_point_box": 0}
    no_grad_inputs = (0, 1, 2, 3, 4)

    def forward(self, ctx, boxes, scores, max_output_boxes_per_class=None, iou_threshold=None,
                score_threshold=None):
        limit = 0 if max_output_boxes_per_class is None or not np.size(
            max_output_boxes_per_class) else max(int(np.reshape(max_output_boxes_per_class,
                                                                -1)[0]), 0)
        threshold = 0.0 if iou_threshold is None or not np.size(iou_threshold) else \
            float(np.reshape(iou_threshold, -1)[0])
        selected = []
        for b in range(boxes.shape[0]):
            box = corners(boxes[b], self.center_point_box)
            for c in range(scores.shape[1]):
                s = scores[b, c]
                candidates = np.arange(len(s))
                if score_threshold is not None and np.size(score_threshold):
                    candidates = candidates[s > float(np.reshape(score_threshold, -1)[0])]
                order = candidates[np.lexsort((candidates, -s[candidates]))]
                kept: list[int] = []
                for i in order:
                    if len(kept) >= limit:
                        break
                    if not kept or not (iou(box[i], box[kept]) > threshold).any():
                        kept.append(int(i))
                        selected.append((b, c, int(i)))
        return np.array(selected, np.int64).reshape(-1, 3)

    def backward(self, ctx, dy):
        return (None,) * 5
