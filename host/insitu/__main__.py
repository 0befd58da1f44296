from insitu.cli import main

main()
