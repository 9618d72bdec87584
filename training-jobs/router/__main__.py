"""python -m gearshift.jobs.router [train|publish|list] ...: the same commands as `gearshift router`."""

from gearshift.jobs.router.cli import router

router()
