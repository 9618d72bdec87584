from gearshift.services.policy_server.server import main

main()
