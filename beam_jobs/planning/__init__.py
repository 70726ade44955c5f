"""What to convert, decided in the launcher before any worker starts: the listing, splits, classes and
label ids, the validation carve, shard counts, and which kept work a run resumes.

The modules, one line each: docs/design.md (the one module map).
"""
