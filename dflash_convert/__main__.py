from dflash_convert.cli import main

main()
