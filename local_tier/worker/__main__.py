"""``python -m local_tier.worker --port P``."""

from local_tier.worker.cli import main

raise SystemExit(main())
