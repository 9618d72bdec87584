"""python -m gearshift.services.planner: the planner service in the foreground."""
from gearshift.server import main
from gearshift.services.planner.service import build

main(build)
