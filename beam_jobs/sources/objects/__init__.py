"""Object layouts as the field ships them: COCO, YOLO, Pascal VOC, CVAT, masks beside images, and the one plan
of annotated images they share (class ids, the background's id 0).

The modules, in data-flow order, are in docs/design.md's module map.
"""
