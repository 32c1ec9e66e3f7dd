from localflash.cli.app import main

main()
