from mmchaos.cli import main

main()
