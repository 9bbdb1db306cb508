"""``python -m tpuctl`` runs the command line."""

from tpuctl.cli import main

main()
