from memd.cli.app import main

main()
