from orbit_devdb import main

main()
