provider "aws" {
  region = var.aws_region
}

provider "alicloud" {
  region = var.aliyun_region
}
