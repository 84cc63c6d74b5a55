from orbit_cli.main import main

main()
