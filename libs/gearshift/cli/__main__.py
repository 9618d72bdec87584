from gearshift.cli import main

main()
