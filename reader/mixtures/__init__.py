"""Mixtures: several datasets read as one (the plan, its quotas, label space and repeat factors; its pipeline).

``reader.mixture`` plans one (:mod:`reader.mixtures.plan`), ``reader.build_dataset`` builds it
(:mod:`reader.mixtures.pipeline`). Every public name is the package ``reader``'s; docs/design.md maps the modules.
"""
