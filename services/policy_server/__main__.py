from gearshift.services.policy_server.openmp import set_wait_policy
from gearshift.settings import get_settings

set_wait_policy(get_settings().policy_server.spin_wait)  # before anything imports torch
from gearshift.services.policy_server.server import main  # noqa: E402

main()
