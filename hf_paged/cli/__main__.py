"""`python -m hf_paged.cli ...`, the same as `hf-paged ...`."""

import sys

from hf_paged.cli import main

sys.exit(main())
