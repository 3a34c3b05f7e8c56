"""`python -m hf_paged ...`, the same as `hf-paged ...` (for an environment whose scripts folder is not on PATH)."""

import sys

from hf_paged.cli import main

sys.exit(main())
