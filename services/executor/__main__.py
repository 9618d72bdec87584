"""python -m gearshift.services.executor: the executor service in the foreground."""
from gearshift.server import main
from gearshift.services.executor.service import build

main(build)
