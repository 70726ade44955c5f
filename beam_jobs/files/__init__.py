"""The job's files: how it reads and writes anywhere, what its stages hand each other, how it publishes.

The modules, one line each: docs/design.md (the one module map).
"""
