from hpc.cli import main

main()
