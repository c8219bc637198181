terraform {
  required_version = ">= 1.5"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 6.28"
    }
    alicloud = {
      source  = "aliyun/alicloud"
      version = "~> 1.252"
    }
  }
}
