"""python -m gearshift.services.router: the router service in the foreground."""
from gearshift.server import main
from gearshift.services.router.service import build

main(build)
